"""The console's charts: what each one plots (spec), live gauges' series and runs' trade-off charts."""
