"""Pure decisions: values in, values out. No I/O, no clocks, no exceptions for "doesn't fit"."""
