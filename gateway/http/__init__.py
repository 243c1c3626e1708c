"""HTTP routes: thin, parse -> lifecycle -> answer."""
