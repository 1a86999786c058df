"""What crosses the control socket: the typed models the daemon and its clients share."""
