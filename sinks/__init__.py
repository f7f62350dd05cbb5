"""Prebuilt twophase sinks, one module per external system."""
