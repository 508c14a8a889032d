"""What kb shows of a recorded run, and its copy to another store: report, progress, audit, describe,
export, replay, doctor; transfer (`kb db copy`, verified by replay)."""
