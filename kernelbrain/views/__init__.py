"""What kb makes of a recorded run, read from its log: report, progress, audit, describe, export, replay,
doctor; and transfer, the run copied to another store and verified there by replay."""
