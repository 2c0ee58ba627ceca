"""The trace simulator: openb traces (`trace`), replayed through the scheduler's own filter (`engine`) with a
simulation vendor (`vendor`), reported as tables, JSON and plots (`report`)."""
