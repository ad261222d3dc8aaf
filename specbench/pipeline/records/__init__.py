"""What a run directory holds and how it is read and written: result files, one result row."""
