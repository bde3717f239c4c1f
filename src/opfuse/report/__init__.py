"""Reports: model summaries, fusion reports (text, JSON, HTML)."""
