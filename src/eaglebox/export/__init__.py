"""Export the trained draft as the directory SGLang loads."""
