"""cutedebug.instrument"""
