"""The console's screens. Live ones implement `show_state(app)`; only the active one is called."""
