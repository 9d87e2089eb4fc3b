"""Benchmarks: gatedloop against LangChain's `create_agent` + `HumanInTheLoopMiddleware` (see bench/README.md)."""
