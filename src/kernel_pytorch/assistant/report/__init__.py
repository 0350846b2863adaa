"""The report as a whole: the ranked suggestions built from every section's findings (`suggestions`),
and the renderings, which analyse nothing: terminal, JSON and Markdown (`render`), one HTML file
(`html`) with its charts (`charts`)."""
