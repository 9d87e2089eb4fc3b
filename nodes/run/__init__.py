"""Beside the gate: running tools and the I/O around them, under the gate's rules.

- running.py: running reads and claimed writes. tool_env.py: what a tool is run with. wrapped_run.py: a
  middleware's `wrap_tool_call` around one run. masked_trace.py: a tool with secret arguments, traced masked.
- unknown.py: settling a write whose outcome is unknown (the tool's reconcile, a re-run, the question to a person).
- notices.py: the notification outbox rows for requests a person must answer and for what then happened.
"""
