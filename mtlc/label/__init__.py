"""label.py's work: the labels it reads, the plan of moves, the moves and their log (no torch is imported here)."""
