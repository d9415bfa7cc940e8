"""ottvid: ask questions about videos and ground events in them with OTT-Vid compressed Video-LLMs."""

__version__ = "0.1.0"
