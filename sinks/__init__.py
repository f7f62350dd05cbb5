"""Prebuilt twophase sinks, one module or package per external system."""
