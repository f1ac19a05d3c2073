"""Routing: load a checkpoint with the encoder its contract names and decide; follow the promoted
pointer (`load_promoted`)."""
