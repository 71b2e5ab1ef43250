"""cutedebug.analyses"""
