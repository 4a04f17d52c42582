from topolvm.cli import run

run()
