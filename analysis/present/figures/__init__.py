"""The report's figures, drawn with the shared plotting style (analysis.present.style)."""
