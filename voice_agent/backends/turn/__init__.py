"""End-of-turn detectors: has the caller finished?"""
