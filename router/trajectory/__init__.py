"""The trajectory: its recorder, journals, what goes to S3 (full outputs, pushed files, finished records)."""
