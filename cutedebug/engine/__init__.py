"""cutedebug.engine"""
