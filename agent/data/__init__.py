"""Agent data files: simulated GPU behaviour per model, sample simulated GPU sets, health rules."""
