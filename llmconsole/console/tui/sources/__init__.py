"""Where the console's state comes from: this host's daemon, several hosts' daemons merged, a recorded stream; and the log reads beside them."""
