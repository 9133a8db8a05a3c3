"""Voice activity detectors: is this 20 ms frame speech?"""
