"""What ships beside the runtime to show it and test it: the bundled example agents (`examples`, the default
`TENURE_APP`), the demo behind `make demo` (`demo`), the OpenAI-compatible mock model (`mock_model`) and the
dashboard's live labs (`labs`). Nothing in the runtime imports them."""
