"""Read-only views of a run: report, progress, audit, describe, export, replay, doctor."""
