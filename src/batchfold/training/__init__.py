"""Training jobs for the command line: a generic loop and one :class:`Task` per job."""
