from poirotd.cli import app

app(prog_name="poirotd")
