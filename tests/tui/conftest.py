"""The console's tests: its parts without a screen, Textual pilots and snapshots fed by the
recorded status stream, and the real binary in tmux (those two drive a real engine and carry
the `engine` marker). Snapshots live in tests/tui/__snapshots__/<test module>/."""
