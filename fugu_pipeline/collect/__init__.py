"""Collection: the response store, one partition's collection, and grading (the llm_judge grader
calls a worker)."""
