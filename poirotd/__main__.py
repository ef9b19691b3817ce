from poirotd.cli.main import app

app(prog_name="poirotd")
