from cutedebug.commands.cli import entry

entry()
