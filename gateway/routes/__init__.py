"""HTTP routes: thin, parse -> pipeline -> respond."""
