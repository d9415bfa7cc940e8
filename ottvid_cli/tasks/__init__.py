"""Prompts for each task and parsing of the model's replies."""
