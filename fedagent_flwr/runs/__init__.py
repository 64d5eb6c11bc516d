"""What a run leaves on disk: the run folder (reporting.py) and the server's resume state (resume.py)."""
