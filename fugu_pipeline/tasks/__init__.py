"""Tasks: the BenchGen task record and its graders' specs, batch files, and answer parsing."""
