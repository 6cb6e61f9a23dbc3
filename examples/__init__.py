"""Examples of using the bridge: the demo the README starts with."""
