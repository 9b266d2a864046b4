package ferry.compat;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONObject;
import java.io.BufferedReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.HashMap;
import java.util.Map;
import org.apache.rocketmq.filter.expression.BooleanExpression;
import org.apache.rocketmq.filter.expression.EvaluationContext;
import org.apache.rocketmq.filter.parser.SelectorParser;

/**
 * Apache's own SQL92 selector (rocketmq-filter, what its broker evaluates with
 * enablePropertyFilter=true) as an oracle for ferry's (ferry/sql92.py).
 *
 * <p>Reads a file of JSON lines {"expr": E, "props": {name: value, ...}} and prints one JSON line
 * for each, in order: {"compiles": false} when SelectorParser refuses E, else {"compiles": true,
 * "result": R} with R "TRUE", "FALSE", "NULL" (unknown), "ERROR" (the evaluation threw: the broker
 * then does not select the message) or "OTHER" (a value that is not a boolean).
 */
public final class SqlOracle {
  private SqlOracle() {}

  public static void main(String[] args) throws Exception {
    PrintStream out = new PrintStream(System.out, false, "UTF-8");
    try (BufferedReader in = Files.newBufferedReader(Paths.get(args[0]), StandardCharsets.UTF_8)) {
      String line;
      while ((line = in.readLine()) != null) {
        if (line.isEmpty()) {
          continue;
        }
        JSONObject request = JSON.parseObject(line);
        Map<String, String> props = new HashMap<>();
        JSONObject given = request.getJSONObject("props");
        if (given != null) {
          for (String key : given.keySet()) {
            props.put(key, given.getString(key));
          }
        }
        JSONObject answer = new JSONObject();
        BooleanExpression expression;
        try {
          expression = SelectorParser.parse(request.getString("expr"));
        } catch (Throwable e) {
          answer.put("compiles", false);
          out.println(answer.toJSONString());
          continue;
        }
        answer.put("compiles", true);
        answer.put("result", evaluate(expression, props));
        out.println(answer.toJSONString());
      }
    }
    out.flush();
  }

  private static String evaluate(BooleanExpression expression, Map<String, String> props) {
    EvaluationContext context =
        new EvaluationContext() {
          @Override
          public Object get(String name) {
            return props.get(name);
          }

          @Override
          public Map<String, Object> keyValues() {
            return new HashMap<>(props);
          }
        };
    Object value;
    try {
      value = expression.evaluate(context);
    } catch (Throwable e) {
      return "ERROR";
    }
    if (value == null) {
      return "NULL";
    }
    if (value instanceof Boolean) {
      return ((Boolean) value) ? "TRUE" : "FALSE";
    }
    return "OTHER";
  }
}
