"""The debugger's widgets; each knows how to draw, none knows how to navigate."""
