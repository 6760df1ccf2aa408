"""Offline conversion of SavedModels: convert, model directories (atomic writes), verify."""
