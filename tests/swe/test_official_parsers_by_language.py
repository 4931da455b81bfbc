"""SWE-bench grading of the non-Python runners' logs, through the `swebench` package (arlctl/envs/swe/official.py).

test_official_grading.py reads the Python repositories' logs from runners it really starts. Here every other
log parser the package registers (JavaScript, Go, Rust, Java, C/C++, PHP, Ruby) gets a short log written by
hand in the format its runner prints (jest/vitest/mocha/karma/jasmine/cypress/TAP/deno, `go test -v`,
`cargo test`, maven under `set -x`, gradle, ant, gtest under ctest, doctest XML, redis' tcl runner, automake,
micropython's run-tests, phpunit --testdox, minitest/test-unit/cucumber/rspec), holding passing, failing and,
where the format has them, skipped tests. For each parser (and each variant a parser picks by the row's
version or instance id) the statuses arlctl's report gives are checked against the ones written in the log,
and arlctl's verdict against the package's own, computed here independently with its `get_eval_report` on an
eval log framed with its constants, once where the split resolves and once where it does not. Every repo the
package maps outside Python is graded from its parser's log, and a last test checks that this file and
test_official_grading.py together leave no registry key and no repo out.

Where a parser drops or bends what the runner printed (a timing kept in a name, a skip read as a pass, a
suite name lost), the expectation says what the parser does, with a comment: these tests pin the package's
behaviour, they do not judge it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from arlctl.envs.swe import official

swebench_python = pytest.importorskip("swebench.harness.log_parsers.python")
swebench_grading = pytest.importorskip("swebench.harness.grading")
swebench_constants = pytest.importorskip("swebench.harness.constants")
swebench_types = pytest.importorskip("swebench.types")  # TestSpec stays unimported by name: pytest would collect it

P, F, S = "PASSED", "FAILED", "SKIPPED"


@dataclass(frozen=True)
class Case:
    """One parser (one of its variants) and a log in its runner's format.

    statuses: the whole status map the log must give, derived by hand from the log. splits: (FAIL_TO_PASS,
    PASS_TO_PASS, resolved) triples, at least one resolving and one not. task: the row fields the parser
    branches on (version, instance_id). eval_type: fail_only for the parsers that record failures only
    (the package grades their repos that way: FAIL_ONLY_REPOS)."""

    name: str
    key: str
    log: str
    statuses: dict[str, str]
    splits: list[tuple[list[str], list[str], bool]]
    task: dict[str, str] = field(default_factory=dict)
    eval_type: str = "pass_and_fail"
    exit_code: int = 1


# ---- Go, Rust ------------------------------------------------------------------------------------------

GOTEST_LOG = """\
+ go test -v ./calc/...
=== RUN   TestAdd
--- PASS: TestAdd (0.00s)
=== RUN   TestSub
    calc_test.go:18: Sub(3, 1) = 4, want 2
--- FAIL: TestSub (0.00s)
=== RUN   TestNetwork
    calc_test.go:24: skipping: needs network access
--- SKIP: TestNetwork (0.00s)
=== RUN   TestDiv
=== RUN   TestDiv/by_one
=== RUN   TestDiv/by_zero
    calc_test.go:35: Div(1, 0) did not return an error
--- FAIL: TestDiv (0.00s)
    --- PASS: TestDiv/by_one (0.00s)
    --- FAIL: TestDiv/by_zero (0.00s)
FAIL
FAIL\texample.com/calc\t0.004s
FAIL
"""

CARGO_LOG = """\
   Compiling calc v0.1.0 (/testbed)
    Finished `test` profile [unoptimized + debuginfo] target(s) in 1.42s
     Running unittests src/lib.rs (target/debug/deps/calc-3f9a1c2b7d6e5a40)

running 4 tests
test parse::rejects_empty ... ok
test tests::adds ... ok
test tests::slow_roundtrip ... ignored
test tests::subtracts ... FAILED

failures:

---- tests::subtracts stdout ----
thread 'tests::subtracts' panicked at src/lib.rs:41:9:
assertion `left == right` failed
  left: 4
 right: 2
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    tests::subtracts

test result: FAILED. 2 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s

   Doc-tests calc

running 1 test
test src/lib.rs - add (line 7) ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.21s

error: test failed, to rerun pass `--lib`
"""

# ---- Java ----------------------------------------------------------------------------------------------

GSON = "com.google.gson.functional.EnumTest"
MVN = "+ mvn test -B -pl gson -Dsurefire.printSummary=true -DfailIfNoTests=false"
MAVEN_LOG = f"""\
{MVN} -Dtest={GSON}#testTopLevelEnumSerialization
[INFO] Scanning for projects...
[INFO] -------------------------------------------------------
[INFO]  T E S T S
[INFO] -------------------------------------------------------
[INFO] Running {GSON}
[INFO] Tests run: 1, Failures: 0, Errors: 0, Skipped: 0, Time elapsed: 0.061 s - in {GSON}
[INFO]
[INFO] Results:
[INFO]
[INFO] Tests run: 1, Failures: 0, Errors: 0, Skipped: 0
[INFO]
[INFO] ------------------------------------------------------------------------
[INFO] BUILD SUCCESS
[INFO] ------------------------------------------------------------------------
[INFO] Total time:  3.912 s
{MVN} -Dtest={GSON}#testEnumSubclass
[INFO] Scanning for projects...
[INFO] Running {GSON}
[ERROR] Tests run: 1, Failures: 1, Errors: 0, Skipped: 0, Time elapsed: 0.07 s <<< FAILURE! - in {GSON}
[ERROR] testEnumSubclass({GSON})  Time elapsed: 0.012 s  <<< FAILURE!
junit.framework.AssertionFailedError: expected:<"ROCK"> but was:<"rock">
\tat {GSON}.testEnumSubclass(EnumTest.java:142)
[INFO]
[ERROR] Failures:
[ERROR]   EnumTest.testEnumSubclass:142 expected:<"ROCK"> but was:<"rock">
[ERROR] Tests run: 1, Failures: 1, Errors: 0, Skipped: 0
[INFO] ------------------------------------------------------------------------
[INFO] BUILD FAILURE
[INFO] ------------------------------------------------------------------------
[ERROR] Failed to execute goal org.apache.maven.plugins:maven-surefire-plugin:3.0.0-M5:test (default-test) on project gson: There are test failures.
{MVN} -Dtest={GSON}#testEnumCaseMapping
[INFO] Running {GSON}
[INFO] Tests run: 1, Failures: 0, Errors: 0, Skipped: 0, Time elapsed: 0.05 s - in {GSON}
[INFO] ------------------------------------------------------------------------
[INFO] BUILD SUCCESS
[INFO] ------------------------------------------------------------------------
"""

ANT_LOG = """\
+ ant -Dtests.quiet=true test
Buildfile: /testbed/build.xml

test.javac11:
    [junit] Running lombok.transform.TestWithDelombok
    [junit] [PASS] testGetterLazy(lombok.transform.TestWithDelombok)
    [junit] [FAIL] testBuilderSingular(lombok.transform.TestWithDelombok)
    [junit] [ERR] testValInLambda(lombok.transform.TestWithEcj)
    [junit] [PASS] testAccessors(lombok.transform.TestWithEcj)
    [junit] Tests run: 4, Failures: 1, Errors: 1, Skipped: 0, Time elapsed: 12.3 sec

BUILD FAILED
/testbed/buildScripts/tests.ant.xml:120: Tests failed
"""

LUCENE = "org.apache.lucene.util.TestVersion"
GRADLE_LOG = f"""\
> Task :lucene:core:compileJava UP-TO-DATE
> Task :lucene:core:test

{LUCENE} > testParseLenient PASSED

{LUCENE} > testLatestVersion FAILED
    java.lang.AssertionError: expected:<10> but was:<9>
        at __randomizedtesting.SeedInfo.seed([3A1B2C3D4E5F6A7B:1F2E3D4C5B6A7988]:0)
        at org.junit.Assert.fail(Assert.java:89)

{LUCENE} > testDeprecations SKIPPED

org.apache.lucene.index.TestIndexWriter > testFlushWithNoMerging
WARNING: A command line option has enabled the Security Manager.
PASSED

> Task :lucene:core:test FAILED

4 tests completed, 1 failed, 1 skipped

FAILURE: Build failed with an exception.

* What went wrong:
Execution failed for task ':lucene:core:test'.
> There were failing tests. See the report at: file:///testbed/lucene/core/build/reports/tests/test/index.html

BUILD FAILED in 41s
"""

# ---- C / C++ ------------------------------------------------------------------------------------------

REDIS_LOG = """\
Cleanup: may take some time... OK
Starting test server at port 21079
[ready]: 2345
Testing unit/expire
[ok]: EXPIRE - set timeouts multiple times (2 ms)
[err]: EXPIRE - It should be still possible to read 'x' in tests/unit/expire.tcl
Expected 'foobar' to equal or match ''
[skip]: EXPIRE with big integer overflow when basetime is not set
[ignore]: Redis can trigger resizing: large-memory test
[ok]: SET with EXAT with big integer should report an error (0 ms)
[1/1 done]: unit/expire (3 seconds)

                   The End

Execution time of different units:
  3 seconds - unit/expire

!!! WARNING The following tests failed:

*** [err]: EXPIRE - It should be still possible to read 'x' in tests/unit/expire.tcl
Expected 'foobar' to equal or match ''
Cleanup: may take some time... OK
"""

JQ_LOG = """\
make  check-TESTS
make[1]: Entering directory '/testbed'
PASS: tests/mantest
PASS: tests/jqtest
FAIL: tests/shtest
SKIP: tests/utf8test
============================================================================
Testsuite summary for jq 1.7.1
============================================================================
# TOTAL: 4
# PASS:  2
# SKIP:  1
# XFAIL: 0
# FAIL:  1
# XPASS: 0
# ERROR: 0
============================================================================
See ./test-suite.log
"""

SRC = 'filename="/testbed/tests/src/unit-algorithms.cpp"'
DOCTEST_LOG = f"""\
[100%] Built target test-algorithms_cpp11
+ ./build/tests/test-algorithms_cpp11 -s -r=xml
<?xml version="1.0" encoding="UTF-8"?>
<doctest binary="/testbed/build/tests/test-algorithms_cpp11">
  <Options order_by="file" rand_seed="0" first="0" last="4294967295" abort_after="0" subcase_filter_levels="2147483647" case_sensitive="false" no_throw="false" no_skip="false"/>
  <TestSuite>
    <TestCase name="algorithms" {SRC} line="35">
      <SubCase name="std::all_of" {SRC} line="41">
        <Expression success="true" type="CHECK" {SRC} line="43">
          <Original>
            std::all_of(j_array.begin(), j_array.end(), [](const json&amp; value) {{ return !value.empty(); }})
          </Original>
          <Expanded>
            true
          </Expanded>
        </Expression>
      </SubCase>
      <SubCase name="std::count" {SRC} line="50">
        <Expression success="false" type="CHECK" {SRC} line="52">
          <Original>
            std::count(j_array.begin(), j_array.end(), json(true)) == 2
          </Original>
          <Expanded>
            1 == 2
          </Expanded>
        </Expression>
      </SubCase>
      <OverallResultsAsserts successes="1" failures="1" test_case_success="false"/>
    </TestCase>
    <TestCase name="json pointer" {SRC} line="80">
      <SubCase name="errors" {SRC} line="82">
        <SubCase name="nonexisting" {SRC} line="84">
          <Expression success="true" type="CHECK_THROWS_AS" {SRC} line="86">
            <Original>
              j.at(&quot;/foo&quot;_json_pointer)
            </Original>
            <Expanded>
              j.at(&quot;/foo&quot;_json_pointer)
            </Expanded>
          </Expression>
        </SubCase>
      </SubCase>
      <OverallResultsAsserts successes="1" failures="0" test_case_success="true"/>
    </TestCase>
    <TestCase name="version" {SRC} line="99">
      <Expression success="true" type="CHECK" {SRC} line="101">
        <Original>
          json::meta()[&quot;name&quot;] == &quot;JSON for Modern C++&quot;
        </Original>
        <Expanded>
          true
        </Expanded>
      </Expression>
      <OverallResultsAsserts successes="1" failures="0" test_case_success="true"/>
    </TestCase>
  </TestSuite>
  <OverallResultsAsserts successes="3" failures="1"/>
  <OverallResultsTestCases successes="2" failures="1"/>
</doctest>
"""

MICROPYTHON_LOG = """\
+ cd tests
+ ./run-tests.py basics/int_small.py basics/string_format.py extmod/ssl_basic.py basics/list_slice.py
pass  basics/int_small.py
FAIL  basics/string_format.py
skip  extmod/ssl_basic.py
pass  basics/list_slice.py
4 tests performed (152 individual testcases)
2 tests passed
1 tests skipped: ssl_basic
1 tests failed: string_format
"""

GTEST_LOG = """\
+ ctest --test-dir build -V -R format-test
UpdateCTestConfiguration  from :/testbed/build/DartConfiguration.tcl
test 3
    Start 3: format-test

3: Test command: /testbed/build/bin/format-test
3: Working Directory: /testbed/build/test
3: Test timeout computed to be: 1500
3: [==========] Running 4 tests from 2 test suites.
3: [----------] Global test environment set-up.
3: [----------] 3 tests from format_test
3: [ RUN      ] format_test.escape
3: [       OK ] format_test.escape (0 ms)
3: [ RUN      ] format_test.width
3: /testbed/test/format-test.cc:812: Failure
3: Expected equality of these values:
3:   "  42"
3:   fmt::format("{:4}", 42)
3:     Which is: "42  "
3: [  FAILED  ] format_test.width (1 ms)
3: [ RUN      ] format_test.locale
3: /testbed/test/format-test.cc:1020: Skipped
3: no locale support
3: [  SKIPPED ] format_test.locale (0 ms)
3: [----------] 3 tests from format_test (1 ms total)
3:
3: [----------] 1 test from chrono_test
3: [ RUN      ] chrono_test.format_default
3: [       OK ] chrono_test.format_default (2 ms)
3: [----------] 1 test from chrono_test (2 ms total)
3:
3: [----------] Global test environment tear-down
3: [==========] 4 tests from 2 test suites ran. (3 ms total)
3: [  PASSED  ] 2 tests.
3: [  SKIPPED ] 1 test, listed below:
3: [  SKIPPED ] format_test.locale
3: [  FAILED  ] 1 test, listed below:
3: [  FAILED  ] format_test.width
3:
3:  1 FAILED TEST
1/1 Test #3: format-test ......................***Failed    0.02 sec

0% tests passed, 1 tests failed out of 1
"""

# ---- PHP ----------------------------------------------------------------------------------------------

PHPUNIT_LOG = r"""PHPUnit 10.5.20 by Sebastian Bergmann and contributors.

Runtime:       PHP 8.2.18
Configuration: /testbed/phpunit.xml.dist

Calculation Engine (PhpOffice\PhpSpreadsheetTests\Calculation\CalculationEngine)
 ✔ Round trip of formula with spaces
 ✘ Branch pruning of nested if
   │
   │ Failed asserting that two strings are identical.
   │ --- Expected
   │ +++ Actual
   │ @@ @@
   │ -'6'
   │ +'5'
   │
   │ /testbed/tests/PhpSpreadsheetTests/Calculation/CalculationEngineTest.php:55
   │
 ↩ Cell reference across sheets
   │
   │ requires the zip extension
   │

Cell Address (PhpOffice\PhpSpreadsheetTests\Cell\CellAddress)
 ✔ Converts A1 to row and column

Time: 00:00.123, Memory: 12.00 MB

FAILURES!
Tests: 4, Assertions: 6, Failures: 1, Skipped: 1.
"""

# ---- Ruby ---------------------------------------------------------------------------------------------

MINITEST_LOG = """\
Run options: --verbose --seed 41093

# Running:

TestFilters#test_: filters should convert a date to xmlschema.  = 0.00 s = .
TestFilters#test_: filters should escape xml.  = 0.01 s = F
TestSite#test_: creating sites should read the config file.  = 0.02 s = E
TestSite#test_: creating sites should skip symlinks on windows.  = 0.00 s = S

Finished in 0.034210s, 116.9 runs/s, 146.1 assertions/s.

  1) Failure:
TestFilters#test_: filters should escape xml.  [/testbed/test/test_filters.rb:52]:
Expected "&lt;b&gt;" to be equal to "<b>"

  2) Error:
TestSite#test_: creating sites should read the config file. :
Errno::ENOENT: No such file or directory @ rb_sysopen - _config.yml

4 runs, 5 assertions, 1 failures, 1 errors, 1 skips
"""

# jekyll's progress-format hook prints each scenario's location and name, then cucumber's step marks.
CUCUMBER_LOG = """\
+ bundle exec cucumber --format progress features/collections.feature features/post_data.feature
Using the default profile...

features/collections.feature:4  "Unrendered collection"  ......  (0.412s)
features/post_data.feature:12  "Use post.title variable"  ...F-  (0.233s)
features/post_data.feature:30  "Use post.date variable"  F----  (0.101s)

(::) failed steps (::)

expected "Post title: My post" to include "Post title: My Post" (RSpec::Expectations::ExpectationNotMetError)
./features/step_definitions.rb:177:in `block in <top (required)>'
features/post_data.feature:16:in `I should see "Post title: My Post" in "_site/2009/03/27/star-wars.html"'

Failing Scenarios:
cucumber features/post_data.feature:12 # Scenario: Use post.title variable
cucumber features/post_data.feature:30 # Scenario: Use post.date variable

3 scenarios (2 failed, 1 passed)
15 steps (2 failed, 5 skipped, 8 passed)
0m1.234s


Worst offenders:
  features/collections.feature:4   "Unrendered collection"                      (0.412s)
"""

RUBY_UNIT_LOG = """\
Loaded suite /testbed/vendor/bundle/ruby/3.2.0/gems/rake-13.0.6/lib/rake/rake_test_loader
Started
CalcTest:
  test: adds two numbers:\t\t\t\t\t.: (0.000523)
  test: subtracts two numbers:\t\t\t\tF
===============================================================================
Failure: test: subtracts two numbers(CalcTest)
/testbed/test/test_calc.rb:12:in `block in <class:CalcTest>'
<2> expected but was
<4>
===============================================================================
: (0.012345)
  test: omitted on this platform:\t\t\t\tO
===============================================================================
Omission: needs inotify [test: omitted on this platform(CalcTest)]
/testbed/test/test_calc.rb:16:in `block in <class:CalcTest>'
===============================================================================
: (0.000211)
  test: raises on a bad record:\t\t\t\tE
===============================================================================
Error: test: raises on a bad record(CalcTest): RuntimeError: boom
/testbed/test/test_calc.rb:20:in `block in <class:CalcTest>'
===============================================================================
: (0.000304)
  test_emit_tag:\t\t\t\t\t\t.: (0.000102)

Finished in 0.0142 seconds.
-------------------------------------------------------------------------------
5 tests, 3 assertions, 1 failures, 1 errors, 0 pendings, 1 omissions, 0 notifications
60% passed
-------------------------------------------------------------------------------
"""

REDUNDANT = "RuboCop::Cop::Style::RedundantSelf"
RSPEC_LOG = f"""\
+ bundle exec rspec spec/rubocop/cop/style/redundant_self_spec.rb --format json | jq -r '.examples[] | "\\(.full_description) - \\(.status)"'
{REDUNDANT} reports an offense for a self receiver on an rvalue - passed
{REDUNDANT} does not report an offense when the receiver is needed - failed
{REDUNDANT} accepts a self receiver used to call a setter - passed
{REDUNDANT} autocorrects inside a block - pending
"""

# ---- JavaScript: jest, vitest, karma, TAP -------------------------------------------------------------

JEST_LOG = """\
+ yarn jest --verbose packages/docusaurus-utils
PASS packages/docusaurus-utils/src/__tests__/urlUtils.test.ts
  normalizeUrl
    ✓ normalizes slashes (4 ms)
    ✓ keeps the protocol
FAIL packages/docusaurus-utils/src/__tests__/pathUtils.test.ts
  isNameTooLong
    ✕ rejects names over 255 bytes (3 ms)
    ○ skipped works on windows paths
  shortName
    ✓ truncates long names

  ● isNameTooLong › rejects names over 255 bytes

    expect(received).toBe(expected) // Object.is equality

    Expected: true
    Received: false

      12 |   it('rejects names over 255 bytes', () => {
    > 13 |     expect(isNameTooLong('a'.repeat(300))).toBe(true);
         |                                            ^
      14 |   });

      at Object.toBe (packages/docusaurus-utils/src/__tests__/pathUtils.test.ts:13:44)

Test Suites: 1 failed, 1 passed, 2 total
Tests:       1 failed, 1 skipped, 3 passed, 5 total
Snapshots:   0 total
Time:        2.345 s
Ran all test suites matching /packages\\/docusaurus-utils/i.
"""

JEST_JSON_LOG = """\
+ npx jest --json 2>/dev/null | jq -r '.testResults[].assertionResults[] | "[\\(.status | ascii_upcase)] \\(.fullName)"'
[PASSED] List of() creates a list from its arguments
[FAILED] List push() appends values in order
[PENDING] List pop() on an empty list
[PASSED] Map set() keeps insertion order
"""

VITEST_LOG = """\
+ pnpm vitest run --reporter=verbose packages/reactivity
 ❯ packages/reactivity/__tests__/ref.spec.ts (4)
   ❯ reactivity/ref (4)
     ✓ should hold a value
     × should unwrap nested refs
     ↓ should not trigger on ssr [skipped]
     ✓ should work with nested arrays 312ms
 ✓ packages/reactivity/__tests__/computed.spec.ts (1)
   ✓ reactivity/computed (1)
     ✓ should return updated value

⎯⎯⎯⎯⎯⎯⎯ Failed Tests 1 ⎯⎯⎯⎯⎯⎯⎯

 FAIL  packages/reactivity/__tests__/ref.spec.ts > reactivity/ref > should unwrap nested refs
AssertionError: expected 1 to be 2 // Object.is equality
 ❯ packages/reactivity/__tests__/ref.spec.ts:58:24
     56|     const b = reactive({ a })
     57|     a.value++
     58|     expect(b.a).toBe(2)
       |                 ^

⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯⎯[1/1]⎯

 Test Files  1 failed | 1 passed (2)
      Tests  1 failed | 4 passed | 1 skipped (5)
   Start at  10:11:12
   Duration  1.52s
"""

KARMA_LOG = """\
02 05 2024 10:11:12.345:INFO [karma-server]: Karma v6.4.3 server started at http://localhost:9876/
02 05 2024 10:11:12.346:INFO [launcher]: Launching browsers ChromeNoSandboxHeadless with concurrency unlimited
02 05 2024 10:11:12.350:INFO [launcher]: Starting browser ChromeHeadless
02 05 2024 10:11:13.001:INFO [Chrome Headless 124.0.6367.60 (Linux x86_64)]: Connected on socket 8fX with id 1234

  render()
    ✔ should render a div
    ✖ should merge new elements when called multiple times
    Fragment
      ✔ should render its children
  hooks
    ✔ should run effects after render

Finished in 0.412 secs / 0.198 secs @ 10:11:13 GMT+0000 (Coordinated Universal Time)

SUMMARY:
✔ 3 tests completed
✖ 1 test failed

FAILED TESTS:
  render()
    ✖ should merge new elements when called multiple times
      Chrome Headless 124.0.6367.60 (Linux x86_64)
    AssertionError: expected '<div></div>' to equal '<div><span></span></div>'
"""

TAP_LOG = """\
+ npx qunit -r tap test/unit/three.source.unit.js
TAP version 13
ok 1 Core > Object3D > Instancing
not ok 2 Core > Object3D > lookAt
  ---
  message: "Direction matches"
  severity: failed
  actual  : false
  expected: true
  stack: |
        at Object.<anonymous> (file:///testbed/test/unit/src/core/Object3D.tests.js:210:12)
  ...
ok 3 Maths > Vector3 > project # SKIP
1..3
# pass 1
# skip 1
# todo 0
# fail 1
"""

# ---- JavaScript: one repository's runner each ---------------------------------------------------------

CALYPSO_LOG = """\
+ ./node_modules/.bin/jest --verbose -c=test/client/jest.config.js client/state/selectors client/lib/formatting client/lib/url
PASS client/state/selectors/test/get-site-slug.js
  getSiteSlug()
    ✓ should return null if the site is not known (3ms)
    ✓ should return the slug for a known site
FAIL client/lib/formatting/test/index.js
  decodeEntities()
    ✕ should decode named entities (5ms)
    ✓ should leave plain text alone
  stripHTML()
    ✓ should strip tags

  ● decodeEntities() › should decode named entities

    expect(received).toEqual(expected) // deep equality

    Expected: "A & B"
    Received: "A &amp; B"

      at Object.<anonymous> (client/lib/formatting/test/index.js:13:45)

PASS client/lib/url/test/index.js
  isExternal()
    ✓ should treat relative paths as internal

Test Suites: 1 failed, 2 passed, 3 total
Tests:       1 failed, 5 passed, 6 total
"""

BPMN_LOG = """\
+ npx karma start test/config/karma.unit.js --single-run
Chrome Headless 124.0.6367.60 (Linux x86_64) Modeler should import simple process FAILED
\tError: failed to import <bpmn:Definitions>
\t    at importBpmnDiagram (lib/import/Importer.js:51:13)
Chrome Headless 124.0.6367.60 (Linux x86_64) features/modeling - ReplaceShape should replace task with gateway FAILED
\tAssertionError: expected null to exist
\t    at Context.<anonymous> (test/spec/features/modeling/ReplaceShapeSpec.js:88:31)
Chrome Headless 124.0.6367.60 (Linux x86_64): Executed 3412 of 3415 (2 FAILED) (skipped 3) (2 mins 10.5 secs / 2 mins 1.2 secs)
TOTAL: 2 FAILED, 3410 SUCCESS
"""

CARBON_LOG = """\
+ yarn jest packages/react/src/components/Button packages/react/src/components/Modal
PASS packages/react/src/components/Button/__tests__/Button-test.js (5.23 s)
FAIL packages/react/src/components/Modal/__tests__/Modal-test.js
  ● Modal › should close on escape

    expect(jest.fn()).toHaveBeenCalled()

PASS packages/react/src/components/Button/__tests__/IconButton-test.js
Test Suites: 1 failed, 2 passed, 3 total
Tests:       1 failed, 41 passed, 42 total
"""

ESLINT_LOG = """\
+ npx mocha --reporter min tests/lib/rules/no-unused-vars.js tests/lib/rules/no-undef.js


  412 passing (3s)
  2 failing

  1) no-unused-vars
       invalid
         var a = 1;:

      AssertionError [ERR_ASSERTION]: Should have 1 error but had 0: []
      + expected - actual

      -0
      +1

      at testInvalidTemplate (lib/rule-tester/rule-tester.js:968:20)

  2) no-undef
       valid
         typeof a === 'undefined':
     TypeError: Cannot read properties of undefined (reading 'type')
      at Linter._verifyWithoutProcessors (lib/linter/linter.js:1320:13)
"""

GROMMET_LOG = """\
+ yarn jest src/js/components/Button src/js/components/Box src/js/components/Select
PASS src/js/components/Button/__tests__/Button-test.tsx (12.345 s)
PASS src/js/components/Box/__tests__/Box-test.tsx
FAIL src/js/components/Select/__tests__/Select-test.tsx (8.1 s)
  ● Select › renders search

    expect(received).toMatchSnapshot()

Test Suites: 1 failed, 2 passed, 3 total
Tests:       1 failed, 96 passed, 97 total
"""

HIGHLIGHTJS_LOG = """\
+ npx mocha test/index.js


  hljs.highlightAuto()
    ✓ should be detected as python
    1) should be detected as ruby
  markup
    javascript
      ✓ should markup keywords (32ms)
      2) should markup template literals


  2 passing (1s)
  2 failing

  1) hljs.highlightAuto()
       should be detected as ruby:
     AssertionError: expected 'crystal' to equal 'ruby'
      at Context.<anonymous> (test/detect/index.js:28:30)

  2) markup
       javascript
         should markup template literals:
     AssertionError: expected '<span>' to equal '<span class="hljs-string">'
"""

VIEWPORT = "Mobile-friendly: viewport audit"
LIGHTHOUSE_MOCHA_LOG = f"""\
+ yarn mocha core/test/audits/viewport-test.js core/test/gather/gatherers/viewport-dimensions-test.js
running 2 test files

  {VIEWPORT}
    ✔ fails when HTML does not contain a viewport meta tag
    1) fails when a viewport meta tag has no content
    ✔ passes when a valid viewport is provided (15ms)
  Viewport gatherer
    ✔ returns the viewport content


  3 passing (120ms)
  1 failing

  1) {VIEWPORT}
       fails when a viewport meta tag has no content:
     AssertionError: expected true to equal false
"""

LIGHTHOUSE_JEST_LOG = """\
+ yarn jest lighthouse-core/test/audits/viewport-test.js lighthouse-core/test/audits/metrics-test.js
PASS lighthouse-core/test/audits/viewport-test.js
FAIL lighthouse-core/test/audits/metrics-test.js (6.01 s)
  ● Performance: metrics › evaluates valid input correctly

    expect(received).toMatchSnapshot()

Test Suites: 1 failed, 1 passed, 2 total
Tests:       1 failed, 11 passed, 12 total
"""

LIGHTHOUSE_JSON_LOG = f"""\
+ ./node_modules/.bin/mocha --reporter json lighthouse-core/test/audits/viewport-test.js
{{
  "stats": {{
    "suites": 1,
    "tests": 4,
    "passes": 2,
    "pending": 1,
    "failures": 1,
    "start": "2018-03-01T10:11:12.345Z",
    "end": "2018-03-01T10:11:12.400Z",
    "duration": 55
  }},
  "tests": [],
  "pending": [
    {{
      "title": "warns about a zoom-disabled viewport",
      "fullTitle": "{VIEWPORT} warns about a zoom-disabled viewport",
      "currentRetry": 0,
      "err": {{}}
    }}
  ],
  "failures": [
    {{
      "title": "fails when no viewport is set",
      "fullTitle": "{VIEWPORT} fails when no viewport is set",
      "duration": 2,
      "currentRetry": 0,
      "err": {{
        "message": "expected true to equal false",
        "stack": "AssertionError: expected true to equal false\\n    at Context.it (viewport-test.js:20:12)"
      }}
    }}
  ],
  "passes": [
    {{
      "title": "passes when a viewport is set",
      "fullTitle": "{VIEWPORT} passes when a viewport is set",
      "duration": 1,
      "currentRetry": 0,
      "err": {{}}
    }},
    {{
      "title": "reports the viewport content",
      "fullTitle": "{VIEWPORT} reports the viewport content",
      "duration": 0,
      "currentRetry": 0,
      "err": {{}}
    }}
  ]
}}
"""

NEXT_KARMA_LOG = """\
+ xvfb-run -a npx karma start --single-run --component=button
02 05 2024 10:11:12.350:INFO [launcher]: Starting browser Chrome
02 05 2024 10:11:13.100:INFO [Chrome 124.0.6367.60 (Linux x86_64)]: Connected on socket 9aB with id 5678

  Button
    render
      ✓ should render
      ✗ should render loading
    events
      ✓ should handle click

Chrome 124.0.6367.60 (Linux x86_64): Executed 3 of 3 (1 FAILED) (0.254 secs / 0.12 secs)
TOTAL: 1 FAILED, 2 SUCCESS


FAILED TESTS:
  Button
    render
      ✗ should render loading
        Chrome 124.0.6367.60 (Linux x86_64)
      AssertionError: expected false to be true
"""

RULE = "─" * 100
NEXT_CYPRESS_LOG = f"""\
+ npx cypress run --component --spec components/button/__tests__/index-spec.tsx

{RULE}

  Running:  button/index-spec.tsx                                                           (1 of 1)


  Button
    ✓ should render (120ms)
    1) should render loading
    ✓ should handle click (45ms)


  2 passing (1s)
  1 failing

  1) Button
       should render loading:
     AssertionError: Timed out retrying after 4000ms: expected '<button>' to have class 'next-btn-loading'
      at Context.eval (webpack:///./components/button/__tests__/index-spec.tsx:40:10)
"""

OL_LOG = """\
+ npx karma start test/browser/karma.config.cjs --single-run
Chrome Headless 124.0.6367.60 (Linux x86_64) ol/format/GeoJSON readFeature parses a point FAILED
\tAssertionError: expected [ 1, 2 ] to deeply equal [ 2, 1 ]
\t    at Context.<anonymous> (test/browser/spec/ol/format/geojson.test.js:88:35)
Chrome Headless 124.0.6367.60 (Linux x86_64): Executed 4120 of 4125 (1 FAILED) (skipped 5) (1 min 4.2 secs / 58.3 secs)
TOTAL: 1 FAILED, 4119 SUCCESS
+ npx mocha test/node --recursive


  38 passing (2s)
  1 failing

  1) ol/util
       getUid
         returns a different id for each object:
     AssertionError: expected 1 to not equal 1
      at Context.<anonymous> (file:///testbed/test/node/ol/util.test.js:20:26)

+ node rendering/test.js --interactive=false
case heatmap-layer: mismatch 0.0412
"""

PRISM_LOG = """\
+ ./node_modules/.bin/mocha tests/run.js --reporter json
{
  "stats": {
    "suites": 2,
    "tests": 3,
    "passes": 2,
    "pending": 0,
    "failures": 1,
    "duration": 812
  },
  "tests": [],
  "pending": [],
  "failures": [
    {
      "title": "should pass 'javascript/template-string'",
      "fullTitle": "Testing language 'javascript' should pass 'javascript/template-string'",
      "duration": 4,
      "currentRetry": 0,
      "err": {
        "message": "Token stream mismatch"
      }
    }
  ],
  "passes": [
    {
      "title": "should pass 'javascript/keyword'",
      "fullTitle": "Testing language 'javascript' should pass 'javascript/keyword'",
      "duration": 2,
      "currentRetry": 0,
      "err": {}
    },
    {
      "title": "should pass 'css/selector'",
      "fullTitle": "Testing language 'css' should pass 'css/selector'",
      "duration": 1,
      "currentRetry": 0,
      "err": {}
    }
  ]
}
"""

OK, FAILED, TIME = "\x1b[0m\x1b[32mok\x1b[0m", "\x1b[0m\x1b[31mFAILED\x1b[0m", "\x1b[0m\x1b[38;5;245m({})\x1b[0m"
QUARTO_LOG = f"""\
running 3 tests from ./smoke/render/render-html.test.ts
[smoke] > quarto render docs/test-basic.qmd --to html ... {OK} {TIME.format("1s")}
[smoke] > quarto render /tmp/quartoa8f3c1.qmd --to html ... {FAILED} {TIME.format("2s")}
[smoke] > quarto render docs/test-callout.qmd --to pdf ...
  render ... {OK} {TIME.format("850ms")}
  verify ... {OK} {TIME.format("3ms")}
[smoke] > quarto render docs/test-callout.qmd --to pdf ... {OK} {TIME.format("1s")}
running 1 test from ./unit/yaml.test.ts
[unit] > yaml > schema validation rejects unknown keys ... {FAILED} {TIME.format("4ms")}

\x1b[0m\x1b[1m\x1b[37m\x1b[41m ERRORS \x1b[0m

[smoke] > quarto render /tmp/quartoa8f3c1.qmd --to html \x1b[0m\x1b[38;5;245m=> ./smoke/render/render-html.test.ts:30:6\x1b[0m
\x1b[0m\x1b[1m\x1b[31merror\x1b[0m: AssertionError: Values are not equal.
"""

CHART_LOG = """\
> chart.js@4.4.1 test
> karma start --auto-watch false --single-run --browsers chrome

02 05 2024 10:11:12.345:INFO [karma-server]: Karma v6.4.2 server started at http://localhost:9876/
02 05 2024 10:11:12.350:INFO [launcher]: Starting browser Chrome
Chrome 124.0.6367.60 (Linux x86_64) Chart.controllers.bar should draw bars with the right width FAILED
\tExpected 12 to be 14.
\t    at <Jasmine>
\t    at UserContext.<anonymous> (test/specs/controller.bar.tests.js:102:32)
Chrome 124.0.6367.60 (Linux x86_64) Chart.helpers.color should parse rgba strings FAILED
\tExpected 'rgba(0,0,0,1)' to equal 'rgba(0,0,0,0.5)'.
Chrome 124.0.6367.60 (Linux x86_64): Executed 2450 of 2452 (2 FAILED) (skipped 2) (1 min 2.3 secs / 58.1 secs)
TOTAL: 2 FAILED, 2448 SUCCESS
"""

MARKED_LOG = """\
> marked@12.0.0 test:specs
> jasmine --config=jasmine.json

Started
....F....*..

Failures:
1) CommonMark Tabs should pass example 2
  Message:
    Expected '<pre><code>foo</code></pre>' to equal '<pre><code>  foo</code></pre>'.
  Stack:
        at <Jasmine>
        at UserContext.<anonymous> (file:///testbed/test/specs/run-spec.js:27:30)

Pending:

1) GFM Tables should pass example 204
  Temporarily disabled with xit

12 specs, 1 failure, 1 pending spec
Finished in 0.218 seconds
"""

# A real suite prints well over a kilobyte of passing tests between a failure's inline marker and its
# detail block; the parser relies on that (its title pattern looks at most 1000 characters ahead for the
# title's colon, so in a short log the inline "1)" would swallow the detail block and nothing is read).
P5_FILLER = "\n".join(f"      ✓ should map value {i} from the input range to the output range" for i in range(30))
P5JS_LOG = f"""\
Running "mochaChrome:test" (mochaChrome) task

  Rendering
    p5.prototype.createCanvas
      ✓ should create a canvas
      1) should resize the canvas
    p5.prototype.map
{P5_FILLER}


  31 passing (4s)
  1 failing

  1) Rendering
       p5.prototype.createCanvas
         should resize the canvas:

      AssertionError: expected 100 to equal 200
      + expected - actual

      -100
      +200

      at Context.<anonymous> (test/unit/core/rendering.js:40:14)
"""

REACT_PDF_LOG = """\
+ yarn jest packages/layout packages/renderer
PASS packages/layout/tests/text/layoutText.test.js
FAIL packages/renderer/tests/svg.test.js (6.01 s)
  ● Svg › should render a circle

    expect(received).toMatchSnapshot()

PASS packages/layout/tests/node/getPadding.test.js (5.4 s)
Test Suites: 1 failed, 2 passed, 3 total
Tests:       1 failed, 30 passed, 31 total
"""


# ---- the cases ----------------------------------------------------------------------------------------

JEST_STATUSES = {"normalizes slashes": P, "keeps the protocol": P, "rejects names over 255 bytes": F,
                 # jest writes a skipped test as "○ skipped <title>": the word stays in the parsed name
                 "skipped works on windows paths": S, "truncates long names": P}
JEST_SPLITS = [(["truncates long names"], ["normalizes slashes", "skipped works on windows paths"], True),
               (["truncates long names", "rejects names over 255 bytes"], [], False),
               (["skipped works on windows paths"], ["keeps the protocol"], False)]  # a skipped F2P test
JEST_JSON_STATUSES = {  # jest's "pending" status is not among those the parser reads
    "List of() creates a list from its arguments": P, "List push() appends values in order": F,
    "Map set() keeps insertion order": P}
JEST_JSON_SPLITS = [(["List of() creates a list from its arguments"], ["Map set() keeps insertion order"], True),
                    (["List push() appends values in order"], ["Map set() keeps insertion order"], False),
                    (["List pop() on an empty list"], [], False)]  # not in the map: not resolved

CASES = [
    Case("gotest", "parse_log_gotest", GOTEST_LOG,
         {"TestAdd": P, "TestSub": F, "TestNetwork": S, "TestDiv": F, "TestDiv/by_one": P, "TestDiv/by_zero": F},
         [(["TestAdd", "TestDiv/by_one"], ["TestNetwork"], True),  # a skipped P2P test is kept, not broken
          (["TestAdd", "TestSub"], [], False), (["TestDiv/by_zero"], ["TestAdd"], False),
          (["TestNetwork"], ["TestAdd"], False)]),  # a skipped F2P test is not fixed
    # cargo's "ignored" is no status the parser reads; a doc-test's name has spaces, which it does not match.
    Case("cargo", "parse_log_cargo", CARGO_LOG,
         {"parse::rejects_empty": P, "tests::adds": P, "tests::subtracts": F},
         [(["tests::adds"], ["parse::rejects_empty"], True), (["tests::subtracts"], ["tests::adds"], False),
          (["tests::slow_roundtrip"], [], False)]),
    # maven prints no per-test line: each test runs alone (its -Dtest= under set -x) and the build's verdict
    # is that test's, so there is no skipped status.
    Case("maven", "parse_log_maven", MAVEN_LOG,
         {f"{GSON}#testTopLevelEnumSerialization": P, f"{GSON}#testEnumSubclass": F,
          f"{GSON}#testEnumCaseMapping": P},
         [([f"{GSON}#testEnumCaseMapping"], [f"{GSON}#testTopLevelEnumSerialization"], True),
          ([f"{GSON}#testEnumSubclass"], [f"{GSON}#testEnumCaseMapping"], False)]),
    Case("ant", "parse_log_ant", ANT_LOG,  # ERR reads as a failure
         {"testGetterLazy(lombok.transform.TestWithDelombok)": P,
          "testBuilderSingular(lombok.transform.TestWithDelombok)": F,
          "testValInLambda(lombok.transform.TestWithEcj)": F, "testAccessors(lombok.transform.TestWithEcj)": P},
         [(["testAccessors(lombok.transform.TestWithEcj)"], ["testGetterLazy(lombok.transform.TestWithDelombok)"],
           True),
          (["testValInLambda(lombok.transform.TestWithEcj)"], [], False)]),
    # gradle's SKIPPED is not read; a status on its own line (a warning printed in between) is the pending
    # test's; "> Task ... FAILED" is gradle's, not a test's.
    Case("gradle_custom", "parse_log_gradle_custom", GRADLE_LOG,
         {f"{LUCENE} > testParseLenient": P, f"{LUCENE} > testLatestVersion": F,
          "org.apache.lucene.index.TestIndexWriter > testFlushWithNoMerging": P},
         [(["org.apache.lucene.index.TestIndexWriter > testFlushWithNoMerging"], [f"{LUCENE} > testParseLenient"],
           True),
          ([f"{LUCENE} > testParseLenient"], [f"{LUCENE} > testLatestVersion"], False)]),
    Case("redis", "parse_log_redis", REDIS_LOG,  # an [err] name loses its " in <file>" tail
         {"EXPIRE - set timeouts multiple times": P, "EXPIRE - It should be still possible to read 'x'": F,
          "EXPIRE with big integer overflow when basetime is not set": S,
          "Redis can trigger resizing: large-memory test": S,
          "SET with EXAT with big integer should report an error": P},
         [(["SET with EXAT with big integer should report an error"],
           ["EXPIRE - set timeouts multiple times", "Redis can trigger resizing: large-memory test"], True),
          (["EXPIRE - It should be still possible to read 'x'"], [], False),
          (["EXPIRE with big integer overflow when basetime is not set"], [], False)]),
    Case("jq", "parse_log_jq", JQ_LOG,  # automake's SKIP is not read
         {"tests/mantest": P, "tests/jqtest": P, "tests/shtest": F},
         [(["tests/jqtest"], ["tests/mantest"], True), (["tests/shtest"], ["tests/mantest"], False)]),
    # A subcase passes when all its expressions do (nested ones included, and each nested subcase is listed
    # under the test case's name alone); a test case without subcases gets no status.
    Case("doctest", "parse_log_doctest", DOCTEST_LOG,
         {"algorithms > std::all_of": P, "algorithms > std::count": F, "json pointer > errors": P,
          "json pointer > nonexisting": P},
         [(["json pointer > nonexisting"], ["algorithms > std::all_of"], True),
          (["algorithms > std::count"], ["json pointer > errors"], False), (["version"], [], False)]),
    Case("micropython_test", "parse_log_micropython_test", MICROPYTHON_LOG,
         {"basics/int_small.py": P, "basics/string_format.py": F, "extmod/ssl_basic.py": S,
          "basics/list_slice.py": P},
         [(["basics/list_slice.py"], ["basics/int_small.py", "extmod/ssl_basic.py"], True),
          (["basics/string_format.py"], [], False), (["extmod/ssl_basic.py"], [], False)]),
    # gtest's SKIPPED is not read; ctest's "3: " prefix and the summary lines (no timing) are left alone.
    Case("googletest", "parse_log_googletest", GTEST_LOG,
         {"format_test.escape": P, "format_test.width": F, "chrono_test.format_default": P},
         [(["chrono_test.format_default"], ["format_test.escape"], True),
          (["format_test.width"], ["format_test.escape"], False), (["format_test.locale"], [], False)]),
    Case("phpunit", "parse_log_phpunit", PHPUNIT_LOG,
         {"Calculation Engine > Round trip of formula with spaces": P,
          "Calculation Engine > Branch pruning of nested if": F,
          "Calculation Engine > Cell reference across sheets": S, "Cell Address > Converts A1 to row and column": P},
         [(["Cell Address > Converts A1 to row and column"],
           ["Calculation Engine > Round trip of formula with spaces",
            "Calculation Engine > Cell reference across sheets"], True),
          (["Calculation Engine > Branch pruning of nested if"], [], False),
          (["Calculation Engine > Cell reference across sheets"], [], False)]),
    # minitest's skip ("S") reads as a pass: with no . F or E after the last "=", the outcome group falls
    # back to the dot in the timing. An error ("E") reads as a failure.
    Case("minitest", "parse_log_minitest", MINITEST_LOG,
         {"TestFilters#test_: filters should convert a date to xmlschema": P,
          "TestFilters#test_: filters should escape xml": F,
          "TestSite#test_: creating sites should read the config file": F,
          "TestSite#test_: creating sites should skip symlinks on windows": P},
         [(["TestFilters#test_: filters should convert a date to xmlschema"], [], True),
          (["TestFilters#test_: filters should escape xml"], [], False),
          ([], ["TestSite#test_: creating sites should read the config file"], False)]),
    # The name keeps one of the two spaces before the step marks; a scenario whose first step fails ("F----")
    # has no dot before its F and is not read.
    Case("cucumber", "parse_log_cucumber", CUCUMBER_LOG,
         {'features/collections.feature:4  "Unrendered collection" ': P,
          'features/post_data.feature:12  "Use post.title variable" ': F},
         [(['features/collections.feature:4  "Unrendered collection" '], [], True),
          (['features/post_data.feature:12  "Use post.title variable" '], [], False),
          (['features/post_data.feature:30  "Use post.date variable" '], [], False)]),
    Case("ruby_unit", "parse_log_ruby_unit", RUBY_UNIT_LOG,  # test-unit's omission ("O") is a skip
         {"adds two numbers": P, "subtracts two numbers": F, "omitted on this platform": S,
          "raises on a bad record": F, "test_emit_tag": P},
         [(["adds two numbers"], ["test_emit_tag", "omitted on this platform"], True),
          (["adds two numbers"], ["raises on a bad record"], False),
          (["omitted on this platform"], [], False)]),
    Case("rspec_transformed_json", "parse_log_rspec_transformed_json", RSPEC_LOG,  # "pending" is not read
         {f"{REDUNDANT} reports an offense for a self receiver on an rvalue": P,
          f"{REDUNDANT} does not report an offense when the receiver is needed": F,
          f"{REDUNDANT} accepts a self receiver used to call a setter": P},
         [([f"{REDUNDANT} accepts a self receiver used to call a setter"],
           [f"{REDUNDANT} reports an offense for a self receiver on an rvalue"], True),
          ([f"{REDUNDANT} does not report an offense when the receiver is needed"], [], False),
          ([f"{REDUNDANT} autocorrects inside a block"], [], False)]),
    # jekyll picks minitest or cucumber by the instance's PR number.
    Case("jekyll-minitest", "parse_log_jekyll", MINITEST_LOG,
         {"TestFilters#test_: filters should convert a date to xmlschema": P,
          "TestFilters#test_: filters should escape xml": F,
          "TestSite#test_: creating sites should read the config file": F,
          "TestSite#test_: creating sites should skip symlinks on windows": P},
         [(["TestFilters#test_: filters should convert a date to xmlschema"], [], True),
          (["TestFilters#test_: filters should escape xml"], [], False)],
         task={"instance_id": "jekyll__jekyll-9141"}),
    Case("jekyll-cucumber", "parse_log_jekyll", CUCUMBER_LOG,
         {'features/collections.feature:4  "Unrendered collection" ': P,
          'features/post_data.feature:12  "Use post.title variable" ': F},
         [(['features/collections.feature:4  "Unrendered collection" '], [], True),
          (['features/post_data.feature:12  "Use post.title variable" '], [], False)],
         task={"instance_id": "jekyll__jekyll-8761"}),
    Case("jest", "parse_log_jest", JEST_LOG, JEST_STATUSES, JEST_SPLITS),
    Case("jest_json", "parse_log_jest_json", JEST_JSON_LOG, JEST_JSON_STATUSES, JEST_JSON_SPLITS),
    # immutable-js picks jest's verbose or its JSON output by the instance's PR number.
    Case("immutable_js-jest", "parse_log_immutable_js", JEST_LOG, JEST_STATUSES, JEST_SPLITS,
         task={"instance_id": "immutable-js__immutable-js-2006"}),
    Case("immutable_js-jest_json", "parse_log_immutable_js", JEST_JSON_LOG, JEST_JSON_STATUSES, JEST_JSON_SPLITS,
         task={"instance_id": "immutable-js__immutable-js-2005"}),
    # vitest's tree marks a passed file and a passed suite like a test ("(1)" is their count); a failed
    # file or suite is marked "❯", which is not read.
    Case("vitest", "parse_log_vitest", VITEST_LOG,
         {"should hold a value": P, "should unwrap nested refs": F, "should not trigger on ssr": S,
          "should work with nested arrays": P, "packages/reactivity/__tests__/computed.spec.ts (1)": P,
          "reactivity/computed (1)": P, "should return updated value": P},
         [(["should return updated value"], ["should hold a value", "should not trigger on ssr"], True),
          (["should unwrap nested refs"], ["should hold a value"], False),
          (["should not trigger on ssr"], [], False)]),
    # The suite path follows indentation one way only: a suite at the outer level after a nested one is
    # dropped (its test lands under the previous outer suite), and "FAILED TESTS" after SUMMARY is not read.
    Case("karma", "parse_log_karma", KARMA_LOG,
         {"render() > should render a div": P, "render() > should merge new elements when called multiple times": F,
          "render() > Fragment > should render its children": P, "render() > should run effects after render": P},
         [(["render() > Fragment > should render its children"], ["render() > should render a div"], True),
          (["render() > should merge new elements when called multiple times"], [], False),
          (["hooks > should run effects after render"], [], False)]),
    # A TAP directive stays in the name, and a skipped test ("ok ... # SKIP") reads as passed.
    Case("tap", "parse_log_tap", TAP_LOG,
         {"Core > Object3D > Instancing": P, "Core > Object3D > lookAt": F, "Maths > Vector3 > project # SKIP": P},
         [(["Core > Object3D > Instancing"], ["Maths > Vector3 > project # SKIP"], True),
          (["Core > Object3D > lookAt"], ["Core > Object3D > Instancing"], False)]),
    # Only the first jest command's files up to the first failure's detail block ("  ● ") are read: the file
    # jest reports after it (client/lib/url) is not. A "(3ms)" timing is cut, the names join suite and title.
    Case("calypso", "parse_log_calypso", CALYPSO_LOG,
         {"getSiteSlug() - should return null if the site is not known": P,
          "getSiteSlug() - should return the slug for a known site": P,
          "decodeEntities() - should decode named entities": F,
          "decodeEntities() - should leave plain text alone": P, "stripHTML() - should strip tags": P},
         [(["stripHTML() - should strip tags"], ["getSiteSlug() - should return the slug for a known site"], True),
          (["decodeEntities() - should decode named entities"], [], False),
          (["isExternal() - should treat relative paths as internal"], [], False)]),
    # The parsers below record failing tests only (their repos are graded fail-only, in FAIL_ONLY_REPOS): no
    # log can give them a pass; a test the log does not name counts as passing.
    Case("bpmn_js", "parse_log_bpmn_js", BPMN_LOG,  # the name keeps the space before FAILED
         {"Modeler should import simple process ": F,
          "features/modeling - ReplaceShape should replace task with gateway ": F},
         [(["Modeler should import a process with a lane "], ["Viewer should import simple process "], True),
          (["Modeler should import simple process "], [], False)],
         eval_type="fail_only"),
    Case("chart_js", "parse_log_chart_js", CHART_LOG,  # the name keeps the space before FAILED
         {"Chart.controllers.bar should draw bars with the right width ": F,
          "Chart.helpers.color should parse rgba strings ": F},
         [(["Chart.helpers.color should parse hex strings "], ["Chart.controllers.line should draw lines "], True),
          (["Chart.controllers.bar should draw bars with the right width "], [], False)],
         eval_type="fail_only"),
    # The title runs up to the error's class name: mocha's trailing colon stays in it.
    Case("eslint", "parse_log_eslint", ESLINT_LOG,
         {"no-unused-vars invalid var a = 1;:": F, "no-undef valid typeof a === 'undefined':": F},
         [(["no-unused-vars valid var a = 1; a++;:"], ["no-undef valid var a; a = 1;:"], True),
          (["no-unused-vars invalid var a = 1;:"], [], False)],
         eval_type="fail_only"),
    # jasmine lists pending specs numbered like failures: a pending spec reads as failed.
    Case("marked", "parse_log_marked", MARKED_LOG,
         {"CommonMark Tabs should pass example 2": F, "GFM Tables should pass example 204": F},
         [(["CommonMark Tabs should pass example 1"], ["CommonMark Tabs should pass example 3"], True),
          (["CommonMark Tabs should pass example 2"], [], False),
          (["CommonMark Tabs should pass example 1"], ["GFM Tables should pass example 204"], False)],
         eval_type="fail_only"),
    # The karma line's name, the node mocha title (which keeps "Assertion", the part of the error's class
    # before "Error:") and the rendering case that mismatched.
    Case("openlayers", "parse_log_openlayers", OL_LOG,
         {"ol/format/GeoJSON readFeature parses a point": F,
          "ol/util getUid returns a different id for each object: Assertion": F, "heatmap-layer": F},
         [(["ol/format/GeoJSON readFeature parses a line"], ["icon-opacity"], True),
          (["heatmap-layer"], [], False)],
         eval_type="fail_only"),
    Case("p5js", "parse_log_p5js", P5JS_LOG,
         {"Rendering:p5.prototype.createCanvas:should resize the canvas": F},
         [(["Rendering:p5.prototype.createCanvas:should create a canvas"], [], True),
          (["Rendering:p5.prototype.createCanvas:should resize the canvas"], [], False)],
         eval_type="fail_only"),
    # jest's default reporter names test files, not tests: one line per file, its timing cut.
    Case("carbon", "parse_log_carbon", CARBON_LOG,
         {"packages/react/src/components/Button/__tests__/Button-test.js": P,
          "packages/react/src/components/Modal/__tests__/Modal-test.js": F,
          "packages/react/src/components/Button/__tests__/IconButton-test.js": P},
         [(["packages/react/src/components/Button/__tests__/Button-test.js"],
           ["packages/react/src/components/Button/__tests__/IconButton-test.js"], True),
          (["packages/react/src/components/Modal/__tests__/Modal-test.js"], [], False)]),
    Case("react_pdf", "parse_log_react_pdf", REACT_PDF_LOG,
         {"packages/layout/tests/text/layoutText.test.js": P, "packages/renderer/tests/svg.test.js": F,
          "packages/layout/tests/node/getPadding.test.js": P},
         [(["packages/layout/tests/node/getPadding.test.js"], ["packages/layout/tests/text/layoutText.test.js"],
           True),
          (["packages/renderer/tests/svg.test.js"], [], False)]),
    Case("grommet", "parse_log_grommet", GROMMET_LOG,
         {"src/js/components/Button/__tests__/Button-test.tsx": P, "src/js/components/Box/__tests__/Box-test.tsx": P,
          "src/js/components/Select/__tests__/Select-test.tsx": F},
         [(["src/js/components/Box/__tests__/Box-test.tsx"], ["src/js/components/Button/__tests__/Button-test.tsx"],
           True),
          (["src/js/components/Select/__tests__/Select-test.tsx"], [], False)]),
    # Only the innermost suite line names a test (every indented line replaces the suite); the names join
    # with "." and the summary onwards (the failures' details) is cut off.
    Case("highlightjs", "parse_log_highlightjs", HIGHLIGHTJS_LOG,
         {"hljs.highlightAuto().should be detected as python": P, "hljs.highlightAuto().should be detected as ruby": F,
          "javascript.should markup keywords": P, "javascript.should markup template literals": F},
         [(["javascript.should markup keywords"], ["hljs.highlightAuto().should be detected as python"], True),
          (["javascript.should markup template literals"], [], False)]),
    # lighthouse picks its runner by version: mocha (9.5, 10.0, 10.2), jest (3 and later), else mocha's JSON.
    # Under mocha the run's text is stripped first, so its first suite line has no indent and no name.
    Case("lighthouse-mocha", "parse_log_lighthouse", LIGHTHOUSE_MOCHA_LOG,
         {"fails when HTML does not contain a viewport meta tag": P, "fails when a viewport meta tag has no content": F,
          "passes when a valid viewport is provided": P, "Viewport gatherer - returns the viewport content": P},
         [(["passes when a valid viewport is provided"], ["Viewport gatherer - returns the viewport content"], True),
          (["fails when a viewport meta tag has no content"], [], False)],
         task={"version": "10.2"}),
    Case("lighthouse-jest", "parse_log_lighthouse", LIGHTHOUSE_JEST_LOG,
         {"lighthouse-core/test/audits/viewport-test.js": P, "lighthouse-core/test/audits/metrics-test.js": F},
         [(["lighthouse-core/test/audits/viewport-test.js"], [], True),
          (["lighthouse-core/test/audits/metrics-test.js"], [], False)],
         task={"version": "8.6"}),
    Case("lighthouse-mocha_json", "parse_log_lighthouse", LIGHTHOUSE_JSON_LOG,  # pending tests are not read
         {f"{VIEWPORT} passes when a viewport is set": P, f"{VIEWPORT} reports the viewport content": P,
          f"{VIEWPORT} fails when no viewport is set": F},
         [([f"{VIEWPORT} passes when a viewport is set"], [f"{VIEWPORT} reports the viewport content"], True),
          ([f"{VIEWPORT} fails when no viewport is set"], [], False),
          ([f"{VIEWPORT} warns about a zoom-disabled viewport"], [], False)],
         task={"version": "2.9"}),
    # next picks karma's spec output, or cypress' for version 1.27.
    Case("next-karma", "parse_log_next", NEXT_KARMA_LOG,
         {"Button - render - should render": P, "Button - render - should render loading": F,
          "Button - events - should handle click": P},
         [(["Button - events - should handle click"], ["Button - render - should render"], True),
          (["Button - render - should render loading"], [], False)],
         task={"version": "1.25"}),
    Case("next-cypress", "parse_log_next", NEXT_CYPRESS_LOG,
         {"Button: should render": P, "Button: should render loading": F, "Button: should handle click": P},
         [(["Button: should handle click"], ["Button: should render"], True),
          (["Button: should render loading"], [], False)],
         task={"version": "1.27"}),
    Case("prismjs", "parse_log_prismjs", PRISM_LOG,
         {"Testing language 'javascript' should pass 'javascript/template-string'": F,
          "Testing language 'javascript' should pass 'javascript/keyword'": P,
          "Testing language 'css' should pass 'css/selector'": P},
         [(["Testing language 'javascript' should pass 'javascript/keyword'"],
           ["Testing language 'css' should pass 'css/selector'"], True),
          (["Testing language 'javascript' should pass 'javascript/template-string'"], [], False)]),
    # deno's coloured verdicts; a /tmp file in a name is numbered (/tmp/0); a test with steps first prints
    # its name with no verdict (read as failed) and its verdict after the steps; ERRORS ends the reading.
    Case("quarto_cli", "parse_log_quarto_cli", QUARTO_LOG,
         {"[smoke] > quarto render docs/test-basic.qmd --to html": P, "[smoke] > quarto render /tmp/0 --to html": F,
          "[smoke] > quarto render docs/test-callout.qmd --to pdf": P,
          "[unit] > yaml > schema validation rejects unknown keys": F},
         [(["[smoke] > quarto render docs/test-callout.qmd --to pdf"],
           ["[smoke] > quarto render docs/test-basic.qmd --to html"], True),
          (["[unit] > yaml > schema validation rejects unknown keys"], [], False)]),
]

CASE_IDS = [case.name for case in CASES]
PYTHON_REPOS = set(swebench_python.MAP_REPO_TO_PARSER_PY)
OTHER_REPOS = sorted(repo for repo in official.repo_parsers() if repo not in PYTHON_REPOS)


def _row(case: Case, repo: str = "") -> dict[str, str]:
    return {"repo": repo, "eval_type": case.eval_type, **case.task}


def _package_report(case: Case, repo: str, f2p: list[str], p2p: list[str], tmp_path: Path) -> dict:
    """The package's verdict, from its top-level get_eval_report on an eval log framed with its own markers."""
    instance = case.task.get("instance_id", "row")
    spec = swebench_types.TestSpec(
        instance_id=instance, image="", eval_script_list=[], repo=repo, version=case.task.get("version", ""),
        FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, log_parser=case.key, eval_type=case.eval_type)
    path = tmp_path / "eval.log"
    path.write_text(f"{swebench_constants.START_TEST_OUTPUT}\n{case.log}\n{swebench_constants.END_TEST_OUTPUT}\n"
                    f"{swebench_constants.TEST_EXIT_CODE}: {case.exit_code}\n", encoding="utf-8")
    prediction = {"instance_id": instance, "model_name_or_path": "m", "model_patch": "diff"}
    return swebench_grading.get_eval_report(spec, prediction, str(path), include_tests_status=True)[instance]


def _assert_same_verdicts(case: Case, repo: str, tmp_path: Path) -> None:
    for f2p, p2p, resolved in case.splits:
        ours = official.official_report(_row(case, repo), case.log, f2p, p2p, exit_code=case.exit_code,
                                        parser=None if repo else case.key)
        theirs = _package_report(case, repo, f2p, p2p, tmp_path)
        assert ours["parser"] == case.key, (case.name, repo, ours)
        assert ours["log_found"] is theirs["patch_successfully_applied"] is True, (case.name, repo, ours)
        assert ours["tests_status"] == theirs["tests_status"], (case.name, repo, f2p, p2p)
        assert ours["resolved"] is theirs["resolved"] is resolved, (case.name, repo, f2p, p2p)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_statuses_are_the_ones_the_log_shows(case):
    report = official.official_report(_row(case), case.log, [], [], exit_code=case.exit_code, parser=case.key)
    assert report["parser"] == case.key and report["log_found"] is True, report
    assert report["statuses"] == case.statuses
    # A row may name the parser by its registry key without the prefix.
    assert official.parser_for({"log_parser": case.key.removeprefix(official.PREFIX)}) == case.key


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_verdict_is_the_packages_own(case, tmp_path):
    assert {resolved for _, _, resolved in case.splits} == {True, False}, case.name
    _assert_same_verdicts(case, "", tmp_path)


@pytest.mark.parametrize("repo", OTHER_REPOS)
def test_every_other_language_repo_is_graded_from_its_parsers_log(repo, tmp_path):
    key = official.repo_parsers()[repo]
    mapped = [getattr(module, name)[repo] for module in _language_modules() for name in vars(module)
              if name.startswith("MAP_REPO_TO_PARSER") and repo in getattr(module, name)]
    assert mapped and all(fn is official.registry()[key] for fn in mapped), (repo, key)
    case = next((case for case in CASES if case.key == key), None)
    assert case is not None, f"no log here for {key} (the parser of {repo})"
    # The package grades a repo fail-only when its parser records failures only: the case says the same.
    fail_only = repo in swebench_constants.FAIL_ONLY_REPOS
    assert case.eval_type == ("fail_only" if fail_only else "pass_and_fail"), (repo, case.name)
    assert official.parser_for({"repo": repo}) == key
    report = official.official_report(_row(case, repo), case.log, [], [], exit_code=case.exit_code)
    assert report["statuses"] == case.statuses, repo
    _assert_same_verdicts(case, repo, tmp_path)


def _language_modules() -> list:
    import importlib
    import pkgutil

    parsers = importlib.import_module("swebench.harness.log_parsers")
    return [importlib.import_module(f"{parsers.__name__}.{info.name}") for info in pkgutil.iter_modules(parsers.__path__)]


def test_this_file_and_the_python_one_cover_every_parser_and_repo():
    """Every registry key and every mapped repo is covered here or by test_official_grading.py (which runs
    every repo of MAP_REPO_TO_PARSER_PY, so every key whose function that map holds). An alias key (one more
    name for a function already covered) must be listed too: give it a Case reusing that function's log."""
    registry, repos = official.registry(), official.repo_parsers()
    python_functions = {id(fn) for fn in swebench_python.MAP_REPO_TO_PARSER_PY.values()}
    python_keys = {key for key, fn in registry.items() if id(fn) in python_functions}
    keys_here = {case.key for case in CASES}
    assert not keys_here & python_keys, keys_here & python_keys
    missing_keys = sorted(set(registry) - keys_here - python_keys)
    unknown_keys = sorted(keys_here - set(registry))
    assert not missing_keys and not unknown_keys, (
        f"registry keys without a log here or in test_official_grading.py: {missing_keys}; "
        f"keys here the package no longer has: {unknown_keys}")
    repos_here = {repo for repo, key in repos.items() if key in keys_here}
    missing_repos = sorted(set(repos) - repos_here - PYTHON_REPOS)
    assert not missing_repos, f"repos whose parser no test covers: {missing_repos}"
    assert repos_here | PYTHON_REPOS == set(repos) and set(OTHER_REPOS) == repos_here


def test_a_repo_mapped_to_a_parser_outside_the_registry_gets_no_guessed_verdict():
    """The package's maps name a few parsers its registry lacks (a row cannot name them either): arlctl
    knows no parser for those repos and says so instead of grading."""
    registered = {id(fn) for fn in official.registry().values()}
    orphans = sorted(repo for module in _language_modules() for name in vars(module)
                     if name.startswith("MAP_REPO_TO_PARSER")
                     for repo, fn in getattr(module, name).items() if id(fn) not in registered)
    for repo in orphans:
        assert repo not in official.repo_parsers() and official.parser_for({"repo": repo}) is None, repo
        report = official.official_report({"repo": repo}, "PASS a\nFAIL b", ["a"], [], exit_code=1)
        assert report["resolved"] is False and "knows no log parser" in report["error"], repo
