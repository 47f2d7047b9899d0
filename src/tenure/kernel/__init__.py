"""Agent execution: the app and its agent registry, the Context handlers receive, the blocking-call adapter
and the loop-lag sampler. Imports contracts only."""
