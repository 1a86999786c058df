"""The console's widgets: each renders one part of an immutable snapshot, and only on change."""
