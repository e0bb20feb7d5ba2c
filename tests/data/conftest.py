# A repository shipped as test data (a plain-unittest project the red-team suite grades): not swerl's tests.
collect_ignore = ["unittest_project"]
