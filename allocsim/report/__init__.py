"""The ``allocsim report`` page: ``data.report_data`` gathers a trace's runs, ``page.render`` writes the HTML.

``maps.segment_maps`` takes the segment maps of a run; ``allocsim.commands.report.build_report``
runs the policies (as ``allocsim run`` does) and hands the runs here.
"""
