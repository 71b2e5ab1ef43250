"""cutedebug.commands"""
