"""Helpers the tests share: import them from here, never from another test module.

- paths: the repository's root and the data fixtures (tests/fixtures/).
- daemon: the CLI as a subprocess against one LLMCONSOLE_HOME, and homes that clean up after
  themselves (`daemon_home`), the daemon and its engines stopped.
- waiting: `wait_until`, for anything a test polls until it holds.
- recorded: the console fed by the recorded status stream (tests/fixtures/tui/status_stream.json).
- stub_upstream, client_team, pid_plants, kernel_check: a fake OpenAI-shaped upstream,
  background clients, a synthetic engine for the window controller, the kernel's tolerances.
"""
