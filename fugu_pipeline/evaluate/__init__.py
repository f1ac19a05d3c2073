"""Evaluation: metrics, reports and plots, and the promotion gates (it scores routes, so it sits
above route/)."""
