"""What the console shows, read from the daemon's answers: engines, hosts, runs, sweeps, tunes, estimates."""
