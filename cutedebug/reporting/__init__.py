"""cutedebug.reporting"""
