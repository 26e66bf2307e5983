"""thermab: controlled A/B experiments of heat, CPU and speed on LLM inference servers."""

__version__ = "0.1.0"
