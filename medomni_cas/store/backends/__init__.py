"""Built-in backends. Each registers by URL scheme through the `medomni.backends` entry point."""
