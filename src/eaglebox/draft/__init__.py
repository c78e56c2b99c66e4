"""The draft as a format: its shape (:class:`~eaglebox.draft.spec.DraftSpec`) and the directory SGLang loads."""
