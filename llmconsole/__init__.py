"""llmconsole: launch, supervise and tune local vLLM engines from a terminal console."""

__version__ = "0.1.0"
