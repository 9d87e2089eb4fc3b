"""Provider adaptation: what differs between model providers, read once and turned into one shape.

- finish.py: did the provider say it finished, stop short, or refuse (each integration's own words, as data).
- streamed_args.py: strict tool-call arguments rebuilt from a streamed response's chunks.
- answer_format.py: `response_format=`, the final answer as a validated structured value.
"""
