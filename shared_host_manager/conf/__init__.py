"""oslo.config option modules of the scheduler side, one module per group (nova's shape)."""
